// The five-point central difference the reference tests check gradients with (test_reference_backward.cpp,
// test_reference_variants.cpp).
#pragma once

// dL/dx for one float x of a problem, L() the loss recomputed from it:
//   (8 (L(x+h) - L(x-h)) - (L(x+2h) - L(x-2h))) / (12 h),   h = 2^-6 (truncation error O(h^4): about 1e-9 here).
// x is put back as it was.
template <class Loss>
double finite_difference(float& x, Loss&& loss) {
  const float x0 = x, h = 0x1p-6f;
  const float steps[4] = {h, -h, 2 * h, -2 * h};
  double l[4];
  for (int s = 0; s < 4; ++s) {
    x = x0 + steps[s];
    l[s] = loss();
  }
  x = x0;
  return (8.0 * (l[0] - l[1]) - (l[2] - l[3])) / (12.0 * static_cast<double>(h));
}
