"""What keeps the server up under hostile or heavy traffic: request lifecycle (body, admission,
deadline, catch-all), graceful drain, header timeouts, schema budgets."""
