"""The pure functional core: decisions over values, no I/O, no asyncio, no clocks (time is a parameter)."""
