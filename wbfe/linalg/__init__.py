"""The numerical base under the engine, the metrics and the readers: tensors as the readers hand
them over (:mod:`~wbfe.linalg.arrays`), the BLAS/LAPACK calls (:mod:`~wbfe.linalg.blas`), the only
place eigenvalues and log-dets are computed (:mod:`~wbfe.linalg.spectra`) and the FFT view of a conv
kernel (:mod:`~wbfe.linalg.conv_fft`).

A package of its own, below :mod:`wbfe.engine`, because the metrics (a :class:`~wbfe.linalg.spectra.Spectrum`
is their input), the options and the readers import these modules, and the engine imports them.
"""
