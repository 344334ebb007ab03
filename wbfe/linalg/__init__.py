"""The numerical base under the engine, the metrics and the readers: tensors as the readers hand them over
(``arrays``), the BLAS/LAPACK calls (``blas``), the only place eigenvalues and log-dets are computed
(``spectra``) and the FFT view of a conv kernel (``conv_fft``)."""
