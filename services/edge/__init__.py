"""The edge lookup unit's replayer: keeps shared-memory views of every shard current.

Usage: python -m kvcompass.services.edge   (or ``kvcompass edge``)
"""
