"""Reading streams: pull subscriptions and sequence-range reads."""
