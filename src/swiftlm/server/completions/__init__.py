"""Chat and legacy completions (and /tokenize): wire models, request mapping, tools, outputs."""
