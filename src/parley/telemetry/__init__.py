"""What a process tells its operator: every Prometheus metric, declared once, and the
session, turn and run ids a log line is about."""
