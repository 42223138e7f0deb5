"""The websocket link to the server: handshake, frame writing, backend health, the serve loop; imports jobs and below."""
