"""gRPC glue shared by every process: error mapping, server and channel set-up."""
