"""An example host: a product's agent with its own audit table (see its README)."""
