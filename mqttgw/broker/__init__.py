"""The broker core: topics, sessions, the router, the durable store and what clients may touch.  It imports no reactor and no transport; time is passed in."""
