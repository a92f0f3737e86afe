"""Pipeline stages that are not an algorithm's training or an evaluation report: `task=label`,
`memory`, `compile`, `export` and `seeds`. `rlhfjax.main.TASKS` maps every task to its function;
nothing in the library imports a stage."""
