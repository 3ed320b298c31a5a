"""What parley stores and what crosses the wire: tables, migrations, records, payloads.

Declarations only: nothing in this package opens a connection or holds state.
"""
