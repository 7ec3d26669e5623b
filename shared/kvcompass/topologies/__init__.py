"""The paper's topologies as TOML files (data only; read by kvcompass.topology)."""
