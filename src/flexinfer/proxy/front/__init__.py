"""The proxy's own HTTP/1.1 front server: the OpenAI hot path on an asyncio protocol with ``httptools``; every
other request goes to the aiohttp control application."""
