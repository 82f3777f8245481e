"""The query service: analysts who never hold the data query it over HTTP with API tokens, and
ONE accountant per server process checks and debits every query (``dpbudget serve``; the client
is ``dpbudget.connect``; docs/serving.md); the owner's status page is ``page``."""
