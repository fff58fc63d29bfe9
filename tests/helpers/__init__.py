"""Plain helper functions shared by test suites (no fixtures here)."""
