"""The Responses API: wire models, items over chat, streamed events, stored responses."""
