"""Process plumbing every layer may use: metrics, logging, the heap, the descriptor budget, tasks."""
