"""The chaos soak: sustained load on a fleet while every fault strikes, then a history
checker over the store and what the clients saw (docs/soak.md)."""
