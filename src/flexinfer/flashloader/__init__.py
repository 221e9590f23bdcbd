"""The flash-loader: stages model weights from persistent storage into RAM (tmpfs) before a server starts."""
