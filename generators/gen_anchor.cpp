// The generator executable gets its Generators from the kvouter_pipelines object library.
