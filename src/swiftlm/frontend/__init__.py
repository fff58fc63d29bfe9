"""The front end: between the API surfaces (the server's routes, ``LLM``, the CLI) and the engine.

The engine core sees token ids in and token ids out; what turns a caller's input into an engine
request and the engine's tokens into the caller's text lives here.
"""
