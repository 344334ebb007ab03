"""Theory solvers and simulations (MATH.md §6–§7)."""
