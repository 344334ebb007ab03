"""Theory solvers and simulations (docs/math.md §6–§7).

Import the modules directly; nothing is imported here so that ``import wbfe.theory`` stays light:

- :mod:`wbfe.theory.hermite`: Hermite coefficients, the kernel g, λ_σ, q_σ and the scalar channel m.
- :mod:`wbfe.theory.teacher_student`: readouts, the Bayes-optimal fixed point, sweeps and exponents.
- :mod:`wbfe.theory.hmc`: HMC posterior sampling of the teacher–student model (torch).
- :mod:`wbfe.theory.student`: Adam-trained students of varying width (torch).
- :mod:`wbfe.theory.hierarchical`: the hierarchical sequential-feature-recovery model (§7).
"""
