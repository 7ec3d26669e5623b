"""The paper's figures and tables, one module per artefact (``kvcompass report --help``).

Simulator-independent: fig2 (cross-region-only reuse on the traces), table5 (false hits of
the keyless index), fig5b (level plans). Simulator-based: fig9, fig12, fig13, fig14,
fig15, fig16, table4, all reading run folders a resumable grid writes (:mod:`.grid`).
"""
