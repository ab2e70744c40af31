"""DataFrame -> DataFrame steps: small, pure, tested on tiny inline DataFrames."""
