"""The websocket connection to the server: handshake, frame writing, the serve loop; may import anything in
the worker below it (jobs, prompting, backends, settings, metrics)."""
