"""Serving: a validated request -> the turn planner's plan -> choices run on the engine -> the
endpoint's response shape (chat, completions, Responses)."""
