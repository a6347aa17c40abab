"""common-messaging queue providers (install the ``messaging`` extra to use them)."""
