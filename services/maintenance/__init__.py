"""The maintenance unit: sole writer of its shards of the discovery index.

Usage: python -m kvcompass.services.maintenance   (or ``kvcompass mu``)
"""
