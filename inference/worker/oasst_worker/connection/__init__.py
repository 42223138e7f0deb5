"""The websocket link to the server: handshake, frame writing, backend health, model switches (their protocol
half), the serve loop; imports jobs and below."""
