"""Delivery adapters: put hub messages where an agent runtime looks for them."""
