"""Hosts and drivers a user can copy (each directory has its README)."""
