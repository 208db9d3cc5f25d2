"""Detection of GDPA subgraphs in Dynamo graphs (matmul → elementwise activation → matmul).

Empty until the backend rewrite lands; ``gdpa_inductor.backend`` is where the passes will be applied.
"""
