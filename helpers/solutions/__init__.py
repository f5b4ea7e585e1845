"""Solutions to the exercises of the notebooks, one module per notebook."""
