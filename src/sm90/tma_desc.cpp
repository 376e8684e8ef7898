// PLACEHOLDER: TMA descriptor encoding
