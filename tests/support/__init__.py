"""What the tests share: real processes to run and break (a fleet, a gateway, Redis,
PostgreSQL and RabbitMQ servers of a test's own), the hosts a fleet's workers load by name
(``tests.support.hosts:...``), the controls a test writes for them, fake servers (MCP,
webhooks) and checks (event order, the Open Responses schema, metrics).  Fixtures stay in
the ``conftest.py`` files, where pytest finds them."""
