"""The exact-match response cache: its policy, store, stored answers and the routes' lookup."""
