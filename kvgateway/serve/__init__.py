"""The serving half: the hub, subscriptions, sessions, routes, middleware and the HTTP runner."""
