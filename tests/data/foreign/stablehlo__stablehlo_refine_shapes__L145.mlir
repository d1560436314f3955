// CHECK-LABEL: func @eval_clamp
func.func @eval_clamp() -> tensor<3xi64> {
  // CHECK-NOT: stablehlo.clamp
  // CHECK: [[RESULT:%.*]] = stablehlo.constant dense<[1, 3, 4]> : tensor<3xi64>
  // CHECK: return [[RESULT]]
  %0 = stablehlo.constant dense<[1, 1, 1]> : tensor<3xi64>
  %1 = stablehlo.constant dense<[0, 3, 6]> : tensor<3xi64>
  %2 = stablehlo.constant dense<[4, 4, 4]> : tensor<3xi64>
  %3 = stablehlo.clamp %0, %1, %2 : tensor<3xi64>
  func.return %3 : tensor<3xi64>
}
