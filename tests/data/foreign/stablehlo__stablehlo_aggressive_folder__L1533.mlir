// CHECK-LABEL: @xor_fold_boolean_cst
func.func @xor_fold_boolean_cst() -> tensor<4xi1> {
  // CHECK: stablehlo.constant dense<[true, false, true, false]> : tensor<4xi1>
  // CHECK-NOT: stablehlo.xor
  %operand_1 = stablehlo.constant dense<[true, true, false, false]> : tensor<4xi1>
  %operand_2 = stablehlo.constant dense<[false, true, true, false]> : tensor<4xi1>
  %result = stablehlo.xor %operand_1, %operand_2 : tensor<4xi1>
  return %result : tensor<4xi1>
}
