"""The server settings' sections, one module per group of them; :class:`..settings.Settings` inherits them all."""
