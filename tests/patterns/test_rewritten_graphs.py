# ruff: noqa: E501  (the pinned graphs are generated code)
"""The rewritten Dynamo graphs of representative zoo models, pinned with expecttest (static shapes unless a test
says otherwise, fp32, inference). Each graph must contain torch.ops.gdpa.attention_fwd_v1.default with the model's activation,
scale, post_scale and causal flag, and none of the original S/P ops.

Regenerate with ``EXPECTTEST_ACCEPT=1 python -m pytest tests/patterns/test_rewritten_graphs.py`` and read
the diff: a graph that looks wrong is a bug in the pass, not something to pin.
"""

from __future__ import annotations

import expecttest
import torch
from harness import Recorder, reset
from zoo import ZOO_BY_NAME, build


def rewritten_code(name: str, dtype: torch.dtype = torch.float32, dynamic: bool = False) -> str:
    entry = ZOO_BY_NAME[name]
    model, inputs = build(entry)
    model, inputs = model.to(dtype), tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    reset()
    recorder = Recorder(then_backend=False)
    with torch.no_grad():
        torch.compile(model, backend=recorder, dynamic=dynamic)(*inputs)
    fused = sum(r.matched for r in recorder.reports)
    assert fused == entry.rewrites, f"{name}: {fused} rewrites, expected {entry.rewrites}"
    assert len(recorder.codes) == 1, f"{name}: {len(recorder.codes)} graphs"
    return recorder.codes[0]


class TestRewrittenGraphs(expecttest.TestCase):
    def setUp(self):
        super().setUp()
        import gdpa_inductor.config

        self._backend = gdpa_inductor.config.backend
        gdpa_inductor.config.backend = "reference"

    def tearDown(self):
        import gdpa_inductor.config

        gdpa_inductor.config.backend = self._backend
        torch._dynamo.reset()
        super().tearDown()

    def test_qkv_unbind_gelu(self):
        self.assertExpectedInline(rewritten_code("qkv_unbind_gelu"), """\
def forward(self, L_x_ : torch.Tensor, L_self_modules_qkv_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_qkv_parameters_bias_ : torch.nn.parameter.Parameter, L_self_modules_proj_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_proj_parameters_bias_ : torch.nn.parameter.Parameter):
    l_x_ = L_x_
    l_self_modules_qkv_parameters_weight_ = L_self_modules_qkv_parameters_weight_
    l_self_modules_qkv_parameters_bias_ = L_self_modules_qkv_parameters_bias_
    l_self_modules_proj_parameters_weight_ = L_self_modules_proj_parameters_weight_
    l_self_modules_proj_parameters_bias_ = L_self_modules_proj_parameters_bias_
    linear = torch._C._nn.linear(l_x_, l_self_modules_qkv_parameters_weight_, l_self_modules_qkv_parameters_bias_);  l_x_ = l_self_modules_qkv_parameters_weight_ = l_self_modules_qkv_parameters_bias_ = None
    reshape = linear.reshape(2, 12, 3, 4, 8);  linear = None
    permute = reshape.permute(2, 0, 3, 1, 4);  reshape = None
    unbind = permute.unbind(0);  permute = None
    q = unbind[0]
    k = unbind[1]
    v = unbind[2];  unbind = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(q, k, v, None, 'gelu', 0.3535533905932738, 1.0, False, 0.01);  q = k = v = None
    transpose_1 = attention_fwd_direct_v1_default.transpose(1, 2);  attention_fwd_direct_v1_default = None
    o = transpose_1.reshape(2, 12, 32);  transpose_1 = None
    linear_1 = torch._C._nn.linear(o, l_self_modules_proj_parameters_weight_, l_self_modules_proj_parameters_bias_);  o = l_self_modules_proj_parameters_weight_ = l_self_modules_proj_parameters_bias_ = None
    return (linear_1,)""")

    def test_bmm_heads_folded_relu_method(self):
        self.assertExpectedInline(rewritten_code("bmm_heads_folded_relu_method"), """\
def forward(self, L_x_ : torch.Tensor, L_self_modules_q_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_q_parameters_bias_ : torch.nn.parameter.Parameter, L_self_modules_k_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_k_parameters_bias_ : torch.nn.parameter.Parameter, L_self_modules_v_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_v_parameters_bias_ : torch.nn.parameter.Parameter):
    l_x_ = L_x_
    l_self_modules_q_parameters_weight_ = L_self_modules_q_parameters_weight_
    l_self_modules_q_parameters_bias_ = L_self_modules_q_parameters_bias_
    l_self_modules_k_parameters_weight_ = L_self_modules_k_parameters_weight_
    l_self_modules_k_parameters_bias_ = L_self_modules_k_parameters_bias_
    l_self_modules_v_parameters_weight_ = L_self_modules_v_parameters_weight_
    l_self_modules_v_parameters_bias_ = L_self_modules_v_parameters_bias_
    linear = torch._C._nn.linear(l_x_, l_self_modules_q_parameters_weight_, l_self_modules_q_parameters_bias_);  l_self_modules_q_parameters_weight_ = l_self_modules_q_parameters_bias_ = None
    view = linear.view(2, 16, 3, 8);  linear = None
    transpose = view.transpose(1, 2);  view = None
    q = transpose.reshape(6, 16, 8);  transpose = None
    linear_1 = torch._C._nn.linear(l_x_, l_self_modules_k_parameters_weight_, l_self_modules_k_parameters_bias_);  l_self_modules_k_parameters_weight_ = l_self_modules_k_parameters_bias_ = None
    view_1 = linear_1.view(2, 16, 3, 8);  linear_1 = None
    transpose_1 = view_1.transpose(1, 2);  view_1 = None
    k = transpose_1.reshape(6, 16, 8);  transpose_1 = None
    linear_2 = torch._C._nn.linear(l_x_, l_self_modules_v_parameters_weight_, l_self_modules_v_parameters_bias_);  l_x_ = l_self_modules_v_parameters_weight_ = l_self_modules_v_parameters_bias_ = None
    view_2 = linear_2.view(2, 16, 3, 8);  linear_2 = None
    transpose_2 = view_2.transpose(1, 2);  view_2 = None
    v = transpose_2.reshape(6, 16, 8);  transpose_2 = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(q, k, v, None, 'relu', 0.3535533905932738, 1.0, False, 0.01);  q = k = v = None
    view_3 = attention_fwd_direct_v1_default.view(2, 3, 16, 8);  attention_fwd_direct_v1_default = None
    transpose_4 = view_3.transpose(1, 2);  view_3 = None
    reshape_3 = transpose_4.reshape(2, 16, 24);  transpose_4 = None
    return (reshape_3,)""")

    def test_einsum_heads_in_equation_sigmoid(self):
        self.assertExpectedInline(rewritten_code("einsum_heads_in_equation_sigmoid"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    permute = l_q_.permute(0, 2, 1, 3);  l_q_ = None
    permute_1 = l_k_.permute(0, 2, 1, 3);  l_k_ = None
    permute_2 = l_v_.permute(0, 2, 1, 3);  l_v_ = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(permute, permute_1, permute_2, None, 'sigmoid', 0.25, 1.0, False, 0.01);  permute = permute_1 = permute_2 = None
    permute_3 = attention_fwd_direct_v1_default.permute(0, 2, 1, 3);  attention_fwd_direct_v1_default = None
    return (permute_3,)""")

    def test_matmul_scores_einsum_out_hardswish(self):
        self.assertExpectedInline(rewritten_code("matmul_scores_einsum_out_hardswish"), """\
def forward(self, L_k_ : torch.Tensor, L_q_ : torch.Tensor, L_v_ : torch.Tensor):
    l_k_ = L_k_
    l_q_ = L_q_
    l_v_ = L_v_
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_v_, None, 'hardswish', 0.75, 1.0, False, 0.01);  l_q_ = l_k_ = l_v_ = None
    return (attention_fwd_direct_v1_default,)""")

    def test_hstu_silu_relbias_causal(self):
        self.assertExpectedInline(rewritten_code("hstu_silu_relbias_causal"), """\
def forward(self, L_x_ : torch.Tensor, L_self_modules_uvqk_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_uvqk_parameters_bias_ : torch.nn.parameter.Parameter, L_self_parameters_rel_bias_ : torch.nn.parameter.Parameter, L_self_buffers_causal_ : torch.Tensor, L_self_modules_out_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_out_parameters_bias_ : torch.nn.parameter.Parameter):
    l_x_ = L_x_
    l_self_modules_uvqk_parameters_weight_ = L_self_modules_uvqk_parameters_weight_
    l_self_modules_uvqk_parameters_bias_ = L_self_modules_uvqk_parameters_bias_
    l_self_parameters_rel_bias_ = L_self_parameters_rel_bias_
    l_self_buffers_causal_ = L_self_buffers_causal_
    l_self_modules_out_parameters_weight_ = L_self_modules_out_parameters_weight_
    l_self_modules_out_parameters_bias_ = L_self_modules_out_parameters_bias_
    linear = torch._C._nn.linear(l_x_, l_self_modules_uvqk_parameters_weight_, l_self_modules_uvqk_parameters_bias_);  l_x_ = l_self_modules_uvqk_parameters_weight_ = l_self_modules_uvqk_parameters_bias_ = None
    silu = torch.nn.functional.silu(linear);  linear = None
    split = silu.split(32, dim = -1);  silu = None
    u = split[0]
    v = split[1]
    q = split[2]
    k = split[3];  split = None
    view = q.view(2, 16, 2, 16);  q = None
    q_1 = view.transpose(1, 2);  view = None
    view_1 = k.view(2, 16, 2, 16);  k = None
    k_1 = view_1.transpose(1, 2);  view_1 = None
    view_2 = v.view(2, 16, 2, 16);  v = None
    v_1 = view_2.transpose(1, 2);  view_2 = None
    getitem_4 = l_self_parameters_rel_bias_[(slice(None, None, None), slice(None, 16, None), slice(None, 16, None))];  l_self_parameters_rel_bias_ = None
    getitem_5 = l_self_buffers_causal_[(slice(None, 16, None), slice(None, 16, None))]
    attention_buffer_mask_fwd_v1_default = torch.ops.gdpa.attention_buffer_mask_fwd_v1.default(q_1, k_1, v_1, getitem_4, None, None, getitem_5, l_self_buffers_causal_, 'silu', 1.0, 0.0625, 0.01);  q_1 = k_1 = v_1 = getitem_4 = getitem_5 = l_self_buffers_causal_ = None
    transpose_4 = attention_buffer_mask_fwd_v1_default.transpose(1, 2);  attention_buffer_mask_fwd_v1_default = None
    reshape = transpose_4.reshape(2, 16, 32);  transpose_4 = None
    mul_1 = reshape * u;  reshape = u = None
    linear_1 = torch._C._nn.linear(mul_1, l_self_modules_out_parameters_weight_, l_self_modules_out_parameters_bias_);  mul_1 = l_self_modules_out_parameters_weight_ = l_self_modules_out_parameters_bias_ = None
    return (linear_1,)""")

    def test_sigmoid_attention_log_n_bias(self):
        self.assertExpectedInline(rewritten_code("sigmoid_attention_log_n_bias"), """\
def forward(self, L_k_ : torch.Tensor, L_q_ : torch.Tensor, L_v_ : torch.Tensor):
    l_k_ = L_k_
    l_q_ = L_q_
    l_v_ = L_v_
    full = torch.full((), -2.772588722239781, dtype = torch.float32, device = device(type='cpu'))
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_v_, full, 'sigmoid', 0.25, 1.0, False, 0.01);  l_q_ = l_k_ = l_v_ = full = None
    return (attention_fwd_direct_v1_default,)""")

    def test_sigmoid_attention_log_n_bias_bf16(self):
        """In bf16 the graph is the fp32 one pinned above, its constant an fp32 0-d bias, as eager adds the Python
        number in fp32: rounded to bf16, -log n would shift every score by up to half its ulp (0.012 at n = 512)."""
        name = "sigmoid_attention_log_n_bias"
        self.assertEqual(rewritten_code(name, torch.bfloat16), rewritten_code(name))

    def test_pma_seed_expand(self):
        self.assertExpectedInline(rewritten_code("pma_seed_expand"), """\
def forward(self, L_x_ : torch.Tensor, L_self_modules_kv_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_kv_parameters_bias_ : torch.nn.parameter.Parameter, L_self_parameters_seed_ : torch.nn.parameter.Parameter):
    l_x_ = L_x_
    l_self_modules_kv_parameters_weight_ = L_self_modules_kv_parameters_weight_
    l_self_modules_kv_parameters_bias_ = L_self_modules_kv_parameters_bias_
    l_self_parameters_seed_ = L_self_parameters_seed_
    linear = torch._C._nn.linear(l_x_, l_self_modules_kv_parameters_weight_, l_self_modules_kv_parameters_bias_);  l_x_ = l_self_modules_kv_parameters_weight_ = l_self_modules_kv_parameters_bias_ = None
    chunk = linear.chunk(2, dim = -1);  linear = None
    t = chunk[0]
    t_1 = chunk[1];  chunk = None
    view = t.view(2, 16, 4, 8);  t = None
    k = view.transpose(1, 2);  view = None
    view_1 = t_1.view(2, 16, 4, 8);  t_1 = None
    v = view_1.transpose(1, 2);  view_1 = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_self_parameters_seed_, k, v, None, 'gelu', 0.3535533905932738, 1.0, False, 0.01);  l_self_parameters_seed_ = k = v = None
    transpose_3 = attention_fwd_direct_v1_default.transpose(1, 2);  attention_fwd_direct_v1_default = None
    reshape = transpose_3.reshape(2, 4, 32);  transpose_3 = None
    return (reshape,)""")

    def test_pffn_einsum(self):
        self.assertExpectedInline(rewritten_code("pffn_einsum"), """\
def forward(self, L_x_ : torch.Tensor, L_self_modules_w1_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_w1_parameters_bias_ : torch.nn.parameter.Parameter, L_user_ : torch.Tensor, L_self_modules_w2_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_w2_parameters_bias_ : torch.nn.parameter.Parameter):
    l_x_ = L_x_
    l_self_modules_w1_parameters_weight_ = L_self_modules_w1_parameters_weight_
    l_self_modules_w1_parameters_bias_ = L_self_modules_w1_parameters_bias_
    l_user_ = L_user_
    l_self_modules_w2_parameters_weight_ = L_self_modules_w2_parameters_weight_
    l_self_modules_w2_parameters_bias_ = L_self_modules_w2_parameters_bias_
    linear = torch._C._nn.linear(l_user_, l_self_modules_w1_parameters_weight_, l_self_modules_w1_parameters_bias_);  l_self_modules_w1_parameters_weight_ = l_self_modules_w1_parameters_bias_ = None
    w1 = linear.reshape(2, 16, 24);  linear = None
    linear_1 = torch._C._nn.linear(l_user_, l_self_modules_w2_parameters_weight_, l_self_modules_w2_parameters_bias_);  l_user_ = l_self_modules_w2_parameters_weight_ = l_self_modules_w2_parameters_bias_ = None
    w2 = linear_1.reshape(2, 24, 16);  linear_1 = None
    permute = w1.permute(0, 2, 1);  w1 = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_x_, permute, w2, None, 'relu', 1.0, 1.0, False, 0.01);  l_x_ = permute = w2 = None
    return (attention_fwd_direct_v1_default,)""")

    def test_gqa_blocked_repeat_interleave(self):
        self.assertExpectedInline(rewritten_code("gqa_blocked_repeat_interleave"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_v_, None, 'silu', 0.25, 1.0, False, 0.01);  l_q_ = l_k_ = l_v_ = None
    return (attention_fwd_direct_v1_default,)""")

    def test_gqa_interleaved_repeat(self):
        # interleaved heads (kv head h % Hkv) are not the op's blocked mapping: the .repeat must stay
        self.assertExpectedInline(rewritten_code("gqa_interleaved_repeat"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    k = l_k_.repeat(1, 2, 1, 1);  l_k_ = None
    v = l_v_.repeat(1, 2, 1, 1);  l_v_ = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, k, v, None, 'gelu', 0.25, 1.0, False, 0.01);  l_q_ = k = v = None
    return (attention_fwd_direct_v1_default,)""")

    def test_param_temperature_gelu(self):
        self.assertExpectedInline(rewritten_code("param_temperature_gelu"), """\
def forward(self, L_k_ : torch.Tensor, L_q_ : torch.Tensor, L_self_parameters_temp_ : torch.nn.parameter.Parameter, L_v_ : torch.Tensor):
    l_k_ = L_k_
    l_q_ = L_q_
    l_self_parameters_temp_ = L_self_parameters_temp_
    l_v_ = L_v_
    exp = l_self_parameters_temp_.exp();  l_self_parameters_temp_ = None
    mul_1 = l_q_ * exp;  l_q_ = exp = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(mul_1, l_k_, l_v_, None, 'gelu', 1.0, 1.0, False, 0.01);  mul_1 = l_k_ = l_v_ = None
    return (attention_fwd_direct_v1_default,)""")

    def test_gpt2_causal_buffer_before_gelu(self):
        self.assertExpectedInline(rewritten_code("gpt2_causal_buffer_before_gelu"), """\
def forward(self, L_x_ : torch.Tensor, L_self_modules_c_attn_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_c_attn_parameters_bias_ : torch.nn.parameter.Parameter, L_self_buffers_bias_ : torch.Tensor, L_self_modules_c_proj_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_c_proj_parameters_bias_ : torch.nn.parameter.Parameter):
    l_x_ = L_x_
    l_self_modules_c_attn_parameters_weight_ = L_self_modules_c_attn_parameters_weight_
    l_self_modules_c_attn_parameters_bias_ = L_self_modules_c_attn_parameters_bias_
    l_self_buffers_bias_ = L_self_buffers_bias_
    l_self_modules_c_proj_parameters_weight_ = L_self_modules_c_proj_parameters_weight_
    l_self_modules_c_proj_parameters_bias_ = L_self_modules_c_proj_parameters_bias_
    linear = torch._C._nn.linear(l_x_, l_self_modules_c_attn_parameters_weight_, l_self_modules_c_attn_parameters_bias_);  l_x_ = l_self_modules_c_attn_parameters_weight_ = l_self_modules_c_attn_parameters_bias_ = None
    split = linear.split(32, dim = 2);  linear = None
    q = split[0]
    k = split[1]
    v = split[2];  split = None
    view = q.view(2, 12, 4, 8);  q = None
    q_1 = view.transpose(1, 2);  view = None
    view_1 = k.view(2, 12, 4, 8);  k = None
    k_1 = view_1.transpose(1, 2);  view_1 = None
    view_2 = v.view(2, 12, 4, 8);  v = None
    v_1 = view_2.transpose(1, 2);  view_2 = None
    getitem_3 = l_self_buffers_bias_[(slice(None, None, None), slice(None, None, None), slice(None, 12, None), slice(None, 12, None))]
    eq = getitem_3 == 0;  getitem_3 = None
    logical_not = torch.logical_not(eq);  eq = None
    attention_buffer_mask_fwd_v1_default = torch.ops.gdpa.attention_buffer_mask_fwd_v1.default(q_1, k_1, v_1, None, None, None, logical_not, l_self_buffers_bias_, 'gelu', 0.35355339059327373, 1.0, 0.01);  q_1 = k_1 = v_1 = logical_not = l_self_buffers_bias_ = None
    transpose_4 = attention_buffer_mask_fwd_v1_default.transpose(1, 2);  attention_buffer_mask_fwd_v1_default = None
    contiguous = transpose_4.contiguous();  transpose_4 = None
    view_3 = contiguous.view(2, 12, 32);  contiguous = None
    linear_1 = torch._C._nn.linear(view_3, l_self_modules_c_proj_parameters_weight_, l_self_modules_c_proj_parameters_bias_);  view_3 = l_self_modules_c_proj_parameters_weight_ = l_self_modules_c_proj_parameters_bias_ = None
    return (linear_1,)""")

    def test_causal_where_arange_silu(self):
        self.assertExpectedInline(rewritten_code("causal_where_arange_silu"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_v_, None, 'silu', 0.25, 1.0, True, 0.01);  l_q_ = l_k_ = l_v_ = None
    return (attention_fwd_direct_v1_default,)""")

    def test_cross_chunk_relu_pow2(self):
        self.assertExpectedInline(rewritten_code("cross_chunk_relu_pow2"), """\
def forward(self, L_self_modules_q_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_q_parameters_bias_ : torch.nn.parameter.Parameter, L_x_ : torch.Tensor, L_self_modules_kv_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_kv_parameters_bias_ : torch.nn.parameter.Parameter, L_mem_ : torch.Tensor):
    l_self_modules_q_parameters_weight_ = L_self_modules_q_parameters_weight_
    l_self_modules_q_parameters_bias_ = L_self_modules_q_parameters_bias_
    l_x_ = L_x_
    l_self_modules_kv_parameters_weight_ = L_self_modules_kv_parameters_weight_
    l_self_modules_kv_parameters_bias_ = L_self_modules_kv_parameters_bias_
    l_mem_ = L_mem_
    linear = torch._C._nn.linear(l_x_, l_self_modules_q_parameters_weight_, l_self_modules_q_parameters_bias_);  l_x_ = l_self_modules_q_parameters_weight_ = l_self_modules_q_parameters_bias_ = None
    view = linear.view(2, 10, 2, 16);  linear = None
    q = view.transpose(1, 2);  view = None
    linear_1 = torch._C._nn.linear(l_mem_, l_self_modules_kv_parameters_weight_, l_self_modules_kv_parameters_bias_);  l_mem_ = l_self_modules_kv_parameters_weight_ = l_self_modules_kv_parameters_bias_ = None
    chunk = linear_1.chunk(2, dim = -1);  linear_1 = None
    k = chunk[0]
    v = chunk[1];  chunk = None
    view_1 = k.view(2, 20, 2, 16);  k = None
    k_1 = view_1.transpose(1, 2);  view_1 = None
    view_2 = v.view(2, 20, 2, 16);  v = None
    v_1 = view_2.transpose(1, 2);  view_2 = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(q, k_1, v_1, None, 'relu_square', 0.25, 1.0, False, 0.01);  q = k_1 = v_1 = None
    transpose_4 = attention_fwd_direct_v1_default.transpose(1, 2);  attention_fwd_direct_v1_default = None
    reshape = transpose_4.reshape(2, 10, 32);  transpose_4 = None
    return (reshape,)""")

    def test_float_cast_then_back(self):
        self.assertExpectedInline(rewritten_code("float_cast_then_back"), """\
def forward(self, L_self_modules_qkv_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_qkv_parameters_bias_ : torch.nn.parameter.Parameter, L_x_ : torch.Tensor):
    l_self_modules_qkv_parameters_weight_ = L_self_modules_qkv_parameters_weight_
    l_self_modules_qkv_parameters_bias_ = L_self_modules_qkv_parameters_bias_
    l_x_ = L_x_
    linear = torch._C._nn.linear(l_x_, l_self_modules_qkv_parameters_weight_, l_self_modules_qkv_parameters_bias_);  l_x_ = l_self_modules_qkv_parameters_weight_ = l_self_modules_qkv_parameters_bias_ = None
    chunk = linear.chunk(3, dim = -1);  linear = None
    t = chunk[0]
    t_1 = chunk[1]
    t_2 = chunk[2];  chunk = None
    view = t.view(2, 12, 2, 16);  t = None
    q = view.transpose(1, 2);  view = None
    view_1 = t_1.view(2, 12, 2, 16);  t_1 = None
    k = view_1.transpose(1, 2);  view_1 = None
    view_2 = t_2.view(2, 12, 2, 16);  t_2 = None
    v = view_2.transpose(1, 2);  view_2 = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(q, k, v, None, 'gelu', 0.25, 1.0, False, 0.01);  q = k = v = None
    transpose_4 = attention_fwd_direct_v1_default.transpose(1, 2);  attention_fwd_direct_v1_default = None
    reshape = transpose_4.reshape(2, 12, 32);  transpose_4 = None
    return (reshape,)""")

    def test_stacked_chains_three(self):
        self.assertExpectedInline(rewritten_code("stacked_chains_three"), """\
def forward(self, L_k_ : torch.Tensor, L_q_ : torch.Tensor, L_vs_0_ : torch.Tensor, L_vs_1_ : torch.Tensor, L_vs_2_ : torch.Tensor):
    l_k_ = L_k_
    l_q_ = L_q_
    l_vs_0_ = L_vs_0_
    l_vs_1_ = L_vs_1_
    l_vs_2_ = L_vs_2_
    attention_fwd_direct_v1_default_1 = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_vs_0_, None, 'gelu', 0.25, 1.0, False, 0.01);  l_q_ = l_k_ = l_vs_0_ = None
    mul_1 = attention_fwd_direct_v1_default_1 * 0.25;  attention_fwd_direct_v1_default_1 = None
    silu = torch.nn.functional.silu(mul_1);  mul_1 = None
    transpose_1 = l_vs_1_.transpose(-2, -1);  l_vs_1_ = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(silu, transpose_1, l_vs_2_, None, 'sigmoid', 0.25, 1.0, False, 0.01);  silu = transpose_1 = l_vs_2_ = None
    return (attention_fwd_direct_v1_default,)""")

    def test_padded_lengths_key_mask_gelu(self):
        self.assertExpectedInline(rewritten_code("padded_lengths_key_mask_gelu"), """\
def forward(self, L_k_ : torch.Tensor, L_lengths_ : torch.Tensor, L_q_ : torch.Tensor, L_v_ : torch.Tensor):
    l_k_ = L_k_
    l_lengths_ = L_lengths_
    l_q_ = L_q_
    l_v_ = L_v_
    transpose_1 = l_q_.transpose(1, 2);  l_q_ = None
    transpose_2 = l_k_.transpose(1, 2);  l_k_ = None
    transpose_3 = l_v_.transpose(1, 2);  l_v_ = None
    varlen_fwd_direct_v4_default = torch.ops.gdpa.varlen_fwd_direct_v4.default(transpose_1, transpose_2, transpose_3, None, None, None, None, l_lengths_, 0, 0, 'gelu', 0.25, 1.0, False, -1, -1, 0.01);  transpose_1 = transpose_2 = transpose_3 = l_lengths_ = None
    getitem_3 = varlen_fwd_direct_v4_default[0];  varlen_fwd_direct_v4_default = None
    transpose_4 = getitem_3.transpose(1, 2);  getitem_3 = None
    return (transpose_4,)""")

    def test_hstu_padded_lengths_causal_silu(self):
        self.assertExpectedInline(rewritten_code("hstu_padded_lengths_causal_silu"), """\
def forward(self, L_q_ : torch.Tensor, L_lengths_ : torch.Tensor, L_k_ : torch.Tensor, L_self_buffers_tril_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_lengths_ = L_lengths_
    l_k_ = L_k_
    l_self_buffers_tril_ = L_self_buffers_tril_
    l_v_ = L_v_
    getitem_1 = l_self_buffers_tril_[(slice(None, 12, None), slice(None, 12, None))]
    clamp = l_lengths_.clamp(0, 12);  l_lengths_ = None
    to = clamp.to(torch.int32);  clamp = None
    attention_buffer_mask_fwd_v1_default = torch.ops.gdpa.attention_buffer_mask_fwd_v1.default(l_q_, l_k_, l_v_, None, to, to, getitem_1, l_self_buffers_tril_, 'silu', 1.0, 0.08333333333333333, 0.01);  l_q_ = l_k_ = l_v_ = to = getitem_1 = l_self_buffers_tril_ = None
    return (attention_buffer_mask_fwd_v1_default,)""")

    def test_right_aligned_padding_silu(self):
        self.assertExpectedInline(rewritten_code("right_aligned_padding_silu"), """\
def forward(self, L_k_ : torch.Tensor, L_lengths_ : torch.Tensor, L_q_ : torch.Tensor, L_v_ : torch.Tensor):
    l_k_ = L_k_
    l_lengths_ = L_lengths_
    l_q_ = L_q_
    l_v_ = L_v_
    arange = torch.arange(12, device = device(type='cpu'))
    getitem = arange[(None, slice(None, None, None))];  arange = None
    getitem_1 = l_lengths_[(slice(None, None, None), None)];  l_lengths_ = None
    sub = 12 - getitem_1;  getitem_1 = None
    valid = getitem >= sub;  getitem = sub = None
    getitem_2 = valid[(slice(None, None, None), None, None, slice(None, None, None))];  valid = None
    invert = ~getitem_2;  getitem_2 = None
    where = torch.where(invert, -3.4028234663852886e+38, 0.0);  invert = None
    to = where.to(torch.float32);  where = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_v_, to, 'silu', 1.0, 1.0, False, 0.01);  l_q_ = l_k_ = l_v_ = to = None
    return (attention_fwd_direct_v1_default,)""")

    def test_padding_mask_before_gelu(self):
        self.assertExpectedInline(rewritten_code("padding_mask_before_gelu"), """\
def forward(self, L_k_ : torch.Tensor, L_q_ : torch.Tensor, L_valid_ : torch.Tensor, L_v_ : torch.Tensor):
    l_k_ = L_k_
    l_q_ = L_q_
    l_valid_ = L_valid_
    l_v_ = L_v_
    invert = ~l_valid_;  l_valid_ = None
    where = torch.where(invert, -3.4028234663852886e+38, 0.0);  invert = None
    to = where.to(torch.float32);  where = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_v_, to, 'gelu', 0.25, 1.0, False, 0.01);  l_q_ = l_k_ = l_v_ = to = None
    return (attention_fwd_direct_v1_default,)""")

    def test_hstu_one_minus_triu_buffer(self):
        self.assertExpectedInline(rewritten_code("hstu_one_minus_triu_buffer"), """\
def forward(self, L_q_ : torch.Tensor, L_self_buffers_attn_mask_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_self_buffers_attn_mask_ = L_self_buffers_attn_mask_
    l_k_ = L_k_
    l_v_ = L_v_
    to = l_self_buffers_attn_mask_.to(torch.float32)
    invalid_attn_mask = 1.0 - to;  to = None
    getitem = invalid_attn_mask[(slice(None, 16, None), slice(None, 16, None))];  invalid_attn_mask = None
    unsqueeze = getitem.unsqueeze(0);  getitem = None
    unsqueeze_1 = unsqueeze.unsqueeze(0);  unsqueeze = None
    attention_buffer_mask_fwd_v1_default = torch.ops.gdpa.attention_buffer_mask_fwd_v1.default(l_q_, l_k_, l_v_, None, None, None, unsqueeze_1, l_self_buffers_attn_mask_, 'silu', 1.0, 0.0625, 0.01);  l_q_ = l_k_ = l_v_ = unsqueeze_1 = l_self_buffers_attn_mask_ = None
    return (attention_buffer_mask_fwd_v1_default,)""")

    def test_tril_mask_argument(self):
        self.assertExpectedInline(rewritten_code("tril_mask_argument"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_mask_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_mask_ = L_mask_
    l_v_ = L_v_
    detach = l_mask_.detach()
    getitem = detach[(slice(None, 12, None), slice(None, 12, None))];  detach = None
    attention_buffer_mask_fwd_v1_default = torch.ops.gdpa.attention_buffer_mask_fwd_v1.default(l_q_, l_k_, l_v_, None, None, None, getitem, l_mask_, 'silu', 1.0, 1.0, 0.01);  l_q_ = l_k_ = l_v_ = getitem = l_mask_ = None
    return (attention_buffer_mask_fwd_v1_default,)""")

    def test_hstu_padded_lengths_relbias(self):
        self.assertExpectedInline(rewritten_code("hstu_padded_lengths_relbias"), """\
def forward(self, L_q_ : torch.Tensor, L_lengths_ : torch.Tensor, L_k_ : torch.Tensor, L_self_parameters_rab_ : torch.nn.parameter.Parameter, L_self_buffers_tril_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_lengths_ = L_lengths_
    l_k_ = L_k_
    l_self_parameters_rab_ = L_self_parameters_rab_
    l_self_buffers_tril_ = L_self_buffers_tril_
    l_v_ = L_v_
    getitem_1 = l_self_parameters_rab_[(slice(None, None, None), slice(None, 12, None), slice(None, 12, None))];  l_self_parameters_rab_ = None
    getitem_2 = l_self_buffers_tril_[(slice(None, 12, None), slice(None, 12, None))]
    clamp = l_lengths_.clamp(0, 12);  l_lengths_ = None
    to = clamp.to(torch.int32);  clamp = None
    attention_buffer_mask_fwd_v1_default = torch.ops.gdpa.attention_buffer_mask_fwd_v1.default(l_q_, l_k_, l_v_, getitem_1, to, to, getitem_2, l_self_buffers_tril_, 'silu', 1.0, 0.08333333333333333, 0.01);  l_q_ = l_k_ = l_v_ = getitem_1 = to = getitem_2 = l_self_buffers_tril_ = None
    return (attention_buffer_mask_fwd_v1_default,)""")

    def test_sigmoid_expand_as_mask(self):
        self.assertExpectedInline(rewritten_code("sigmoid_expand_as_mask"), """\
def forward(self, L_k_ : torch.Tensor, L_q_ : torch.Tensor, L_keep_ : torch.Tensor, L_v_ : torch.Tensor):
    l_k_ = L_k_
    l_q_ = L_q_
    l_keep_ = L_keep_
    l_v_ = L_v_
    getitem = l_keep_[(slice(None, None, None), None, None, slice(None, None, None))];  l_keep_ = None
    expand = getitem.expand(2, 2, 12, 12);  getitem = None
    invert = ~expand;  expand = None
    where = torch.where(invert, -3.4028234663852886e+38, 0.0);  invert = None
    to = where.to(torch.float32);  where = None
    add = to + -2.4849066497880004;  to = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_v_, add, 'sigmoid', 0.25, 1.0, False, 0.01);  l_q_ = l_k_ = l_v_ = add = None
    return (attention_fwd_direct_v1_default,)""")

    def test_sigmoid_expand_as_mask_dynamic(self):
        """The mask's expand_as(scores) becomes an expand to sizes read from the scores' operands."""
        self.assertExpectedInline(rewritten_code("sigmoid_expand_as_mask", dynamic=True), """\
def forward(self, s37 : torch.SymInt, s89 : torch.SymInt, L_k_ : torch.Tensor, L_q_ : torch.Tensor, L_keep_ : torch.Tensor, L_v_ : torch.Tensor):
    l_k_ = L_k_
    l_q_ = L_q_
    l_keep_ = L_keep_
    l_v_ = L_v_
    pow_1 = s89 ** -0.5;  s89 = None
    size_1 = l_k_.size()
    getitem_6 = size_1[2];  size_1 = None
    log = math_log(getitem_6);  getitem_6 = log = None
    getitem_8 = l_keep_[(slice(None, None, None), None, None, slice(None, None, None))];  l_keep_ = None
    sym_size_int = torch.ops.aten.sym_size.int(l_q_, 0)
    sym_size_int_1 = torch.ops.aten.sym_size.int(l_q_, 0)
    expand = getitem_8.expand(sym_size_int, sym_size_int_1, 12, 12);  getitem_8 = sym_size_int = sym_size_int_1 = None
    invert = ~expand;  expand = None
    mul_1 = l_q_ * pow_1;  l_q_ = pow_1 = None
    where = torch.where(invert, -3.4028234663852886e+38, 0.0);  invert = None
    to = where.to(torch.float32);  where = None
    add = to + -2.4849066497880004;  to = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(mul_1, l_k_, l_v_, add, 'sigmoid', 1.0, 1.0, False, 0.01);  mul_1 = l_k_ = l_v_ = add = None
    return (attention_fwd_direct_v1_default,)""")

    def test_gpt2_gelu_formula(self):
        self.assertExpectedInline(rewritten_code("gpt2_gelu_formula"), """\
def forward(self, L_k_ : torch.Tensor, L_q_ : torch.Tensor, L_v_ : torch.Tensor):
    l_k_ = L_k_
    l_q_ = L_q_
    l_v_ = L_v_
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_v_, None, 'gelu_tanh', 0.25, 1.0, False, 0.01);  l_q_ = l_k_ = l_v_ = None
    return (attention_fwd_direct_v1_default,)""")

    def test_hstu_reference_padded_gather(self):
        self.assertExpectedInline(rewritten_code("hstu_reference_padded_gather"), """\
def forward(self, L_q_ : torch.Tensor, L_v_ : torch.Tensor, L_offsets_ : torch.Tensor, L_k_ : torch.Tensor):
    l_q_ = L_q_
    l_v_ = L_v_
    l_offsets_ = L_offsets_
    l_k_ = L_k_
    values = l_q_.reshape(26, 32);  l_q_ = None
    values_1 = l_k_.reshape(26, 32);  l_k_ = None
    values_2 = l_v_.reshape(26, 32);  l_v_ = None
    getitem_18 = l_offsets_[slice(1, None, None)]
    getitem_19 = l_offsets_[slice(None, -1, None)]
    sub_3 = getitem_18 - getitem_19;  getitem_18 = getitem_19 = None
    max_ids = sub_3.view(-1, 1, 1);  sub_3 = max_ids = None
    reshape_4 = values_1.reshape(-1, 2, 16);  values_1 = None
    reshape_5 = values_2.reshape(-1, 2, 16);  values_2 = None
    to = l_offsets_.to(torch.int64)
    reshape_6 = values.reshape(-1, 2, 16);  values = None
    varlen_fwd_direct_v4_default = torch.ops.gdpa.varlen_fwd_direct_v4.default(reshape_6, reshape_4, reshape_5, None, to, to, None, None, 12, 12, 'silu', 0.5, 0.08333333333333333, True, -1, -1, 0.01);  reshape_6 = reshape_4 = reshape_5 = None
    getitem_22 = varlen_fwd_direct_v4_default[0];  varlen_fwd_direct_v4_default = None
    clamp_3 = to.clamp(0, 26);  to = None
    arange_4 = torch.arange(26, device = device(type='cpu'))
    searchsorted = torch.searchsorted(l_offsets_, arange_4, right = True);  arange_4 = None
    sample = searchsorted - 1;  searchsorted = None
    arange_5 = torch.arange(26, device = device(type='cpu'))
    getitem_20 = l_offsets_[sample];  l_offsets_ = None
    pos_3 = arange_5 - getitem_20;  arange_5 = getitem_20 = None
    mul_5 = sample * 12;  sample = None
    add_3 = mul_5 + pos_3;  mul_5 = pos_3 = None
    lt_5 = add_3 < 0
    add_5 = add_3 + 48
    where_1 = torch.where(lt_5, add_5, add_3);  lt_5 = add_5 = add_3 = None
    floordiv = where_1 // 12
    mul_7 = floordiv * 12
    sub_9 = where_1 - mul_7;  where_1 = mul_7 = None
    getitem_25 = clamp_3[floordiv]
    add_6 = floordiv + 1;  floordiv = None
    getitem_26 = clamp_3[add_6];  clamp_3 = add_6 = None
    sub_10 = getitem_26 - getitem_25;  getitem_26 = None
    lt_6 = sub_9 < sub_10;  sub_10 = None
    add_7 = getitem_25 + sub_9;  getitem_25 = sub_9 = None
    clamp_5 = add_7.clamp(0, 25);  add_7 = None
    reshape_7 = getitem_22.reshape(-1, 32);  getitem_22 = None
    getitem_27 = reshape_7[clamp_5];  reshape_7 = clamp_5 = None
    unsqueeze_4 = lt_6.unsqueeze(-1);  lt_6 = None
    where_2 = torch.where(unsqueeze_4, getitem_27, 0.0);  unsqueeze_4 = getitem_27 = None
    view_9 = where_2.view(26, 2, 16);  where_2 = None
    return (view_9,)""")

    def test_chain_written_in_place(self):
        # s += rab, SiLU(inplace=True), p /= n and p[future] = 0 read as the out-of-place chain: one fused call
        self.assertExpectedInline(rewritten_code("inplace_hstu_bias"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_self_parameters_rab_ : torch.nn.parameter.Parameter, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_self_parameters_rab_ = L_self_parameters_rab_
    l_v_ = L_v_
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_v_, l_self_parameters_rab_, 'silu', 1.0, 0.08333333333333333, True, 0.01);  l_q_ = l_k_ = l_v_ = l_self_parameters_rab_ = None
    return (attention_fwd_direct_v1_default,)""")

    def test_shared_kv_einsums(self):
        # K and V without a heads index get a size-1 heads dim: every query head reads that one K/V head
        self.assertExpectedInline(rewritten_code("shared_kv_einsum_causal_silu"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    transpose = l_k_.transpose(1, 2);  l_k_ = None
    transpose_1 = l_v_.transpose(0, 1);  l_v_ = None
    permute = transpose.permute(0, 2, 1);  transpose = None
    unsqueeze = permute.unsqueeze(-3);  permute = None
    permute_1 = transpose_1.permute(1, 0, 2);  transpose_1 = None
    unsqueeze_1 = permute_1.unsqueeze(-3);  permute_1 = None
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, unsqueeze, unsqueeze_1, None, 'silu', 1.0, 0.08333333333333333, True, 0.01);  l_q_ = unsqueeze = unsqueeze_1 = None
    return (attention_fwd_direct_v1_default,)""")

    def test_where_zeros_like_fill(self):
        # the zeros shaped like P are read as the number 0 and leave the graph with the block
        self.assertExpectedInline(rewritten_code("where_zeros_like_after_silu"), """\
def forward(self, L_q_ : torch.Tensor, L_k_ : torch.Tensor, L_v_ : torch.Tensor):
    l_q_ = L_q_
    l_k_ = L_k_
    l_v_ = L_v_
    attention_fwd_direct_v1_default = torch.ops.gdpa.attention_fwd_direct_v1.default(l_q_, l_k_, l_v_, None, 'silu', 0.25, 0.08333333333333333, True, 0.01);  l_q_ = l_k_ = l_v_ = None
    return (attention_fwd_direct_v1_default,)""")
