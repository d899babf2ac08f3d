"""Small things every layer shares and nothing of the runner's own: exit statuses, signal handling and stop
requests, timeout detection, number formatting."""
