"""Stream and consumer administration: create-or-update, config diffs, consumer resets, worker consumers."""
