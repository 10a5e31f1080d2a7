"""What the serving half derives from the log: the cache index, lookups, block state, analytics, history."""
