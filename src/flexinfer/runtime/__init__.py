"""The asyncio shell shared by both engines: the Engine port and the single-writer dispatcher."""
