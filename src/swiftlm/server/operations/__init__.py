"""Running a public server: API keys, rate limits, connection and body limits, metrics."""
