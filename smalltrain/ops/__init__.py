"""The operator library: one file per family, each op a Function with its forward and backward side by side."""
