"""How Celery and Kombu are wired: settings from the environment, the app factory, the
turn queue and routing.  No task logic lives here."""
