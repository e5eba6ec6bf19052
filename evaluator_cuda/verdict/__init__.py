"""The verdict, decided in the parent: whose fault a failure is, whether outputs match, and the
result record."""
