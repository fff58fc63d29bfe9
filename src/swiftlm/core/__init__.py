"""The shared nouns every layer speaks: requests, outputs, the scheduler's step, step inputs and
attention metadata, and the request a front end resolves once (``GenerationRequest``). Imports
nothing above ``config`` and ``sampling``."""
