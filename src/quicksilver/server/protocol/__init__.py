"""The wire formats: pydantic request models per endpoint, the error envelope, SSE framing."""
