"""DeepSpeed integration: ``kaisa_ds.initialize`` builds the engine and attaches K-FAC from the ``kfac`` section."""
