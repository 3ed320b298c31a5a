"""Loopback HTTP servers speaking the model providers' protocols, and a recording sink."""
