"""Detection of GDPA subgraphs in Dynamo graphs (matmul → elementwise activation → matmul).

``rewrite.rewrite_gdpa`` is the pass (Inductor's pattern matcher anchored on the second matmul);
``softmax_free_attention`` the pattern, ``chain`` the elementwise chain between the matmuls, ``causal_mask``
the masks that are provably causal, ``fx_nodes`` the spellings of single nodes.
"""
