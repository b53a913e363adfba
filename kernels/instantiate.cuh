// Explicit instantiations of a launch function for the three storage dtypes.
#pragma once

#define FF_INSTANTIATE_FOR_DTYPES(MACRO) \
  MACRO(float)                           \
  MACRO(ff_half)                         \
  MACRO(ff_bfloat16)
