//! The fixture MCP server (placeholder, being written).
